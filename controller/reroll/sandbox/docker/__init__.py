"""The `docker` backend: containers, images, firewall and disk limits."""
