"""What runs the agent as a service: the daemon, the adapter port, systemd units, blocking checks.

ARCHITECTURE.md, "Package map".
"""
