"""The Celery app, configured from settings.py."""

from celery import Celery

app = Celery("example_project")
app.config_from_object("example_project.settings")
app.conf.imports = ["example_project.tasks"]
