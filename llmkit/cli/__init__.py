"""The command line: parses options and calls the library. The only package importing typer."""
