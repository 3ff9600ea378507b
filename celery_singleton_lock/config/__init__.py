"""Configuration: the app's settings, a task's options, the incumbents' option names, and
the lock stores built from the settings."""
