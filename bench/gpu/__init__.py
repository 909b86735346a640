"""The GPU lab: engine layouts on an H200 measured through the gateway (README.md beside it)."""
