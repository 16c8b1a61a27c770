"""ragchains: grounded, cited answers over your own documents."""

__version__ = "0.1.0"
