"""The `local` backend: an isolated sandbox of Linux namespaces, and the plain one."""
