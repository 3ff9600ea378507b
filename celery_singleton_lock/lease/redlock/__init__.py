"""Leases held on a majority of independent Redis masters (Redlock), fenced across holders."""
