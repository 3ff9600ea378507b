"""Limits on a name: up to N holders at once (slots), and a rate (GCRA) per name."""
