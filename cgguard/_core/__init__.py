"""The capture path: the hooks on torch's entry points, the captures under way, the watchers
that follow them, and one installation."""
