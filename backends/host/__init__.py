"""The host backend: torch's own CPU product for host arrays where no GPU runs them."""
