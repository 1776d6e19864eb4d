"""The data_gen version, written into every manifest."""

__version__ = "0.1.0"
