"""A Django project with the locks page under its admin (``test_web_mounts.py``)."""
