"""The package version, in a leaf module: the workspace stamps it on every manifest, and reading
it from `llmkit` itself would make the workspace import the package front (and through it the
API), which imports the workspace."""

__version__ = "0.1.0"
