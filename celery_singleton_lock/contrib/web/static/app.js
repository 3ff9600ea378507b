// celery-singleton-lock's locks page: refresh the live part in place (no full reload).
// The page works without this script; it only keeps the list current.
(function () {
  "use strict";
  var live = document.getElementById("live");
  if (!live) return;
  var every = parseFloat(live.getAttribute("data-refresh") || "0");
  var controls = document.getElementById("refresh-controls");
  var pause = document.getElementById("pause");
  var stamp = document.getElementById("refreshed");
  if (controls) controls.hidden = false;
  if (!(every > 0)) return;
  var busy = false;

  function paused() {
    if (pause && pause.checked) return true;
    // Never swap a form out from under the operator (a release being confirmed).
    var active = document.activeElement;
    return !!(active && active !== document.body && live.contains(active));
  }

  function say(text) {
    if (stamp) stamp.textContent = text;
  }

  function tick() {
    if (busy || document.hidden || paused()) return;
    busy = true;
    fetch(window.location.href, { credentials: "same-origin" })
      .then(function (response) {
        if (!response.ok) throw new Error("HTTP " + response.status);
        return response.text();
      })
      .then(function (html) {
        var fresh = new DOMParser().parseFromString(html, "text/html").getElementById("live");
        if (fresh && !paused()) {
          live.innerHTML = fresh.innerHTML;
          live.setAttribute("data-refreshed", String(Date.now()));
          say("refreshed " + new Date().toLocaleTimeString());
        }
      })
      .catch(function (error) {
        say("refresh failed (" + error.message + "): retrying");
      })
      .finally(function () {
        busy = false;
      });
  }

  window.setInterval(tick, every * 1000);
})();
