"""The test app's tasks, one module per subject, registered on ``tests.support.celery_app``'s
app under that module's name (``App.gen_task_name``): import them through it."""

# The app first, whichever module is imported first: it imports every subject module
# once it is configured, and each of them imports the app.
from .. import celery_app  # noqa: F401
