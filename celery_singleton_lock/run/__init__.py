"""The pool child's side: a delivered message's run takes its running lease, contends for
it, and gives it back at its end."""
