"""The trainctl version (a module of its own: node code and the toolkit read it without
importing the package's lazy API)."""

__version__ = "0.1.0"
