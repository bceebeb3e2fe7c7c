"""bwstack core: typed errors, the one report shape, inputs and the Docker and Jinja handles every stage shares.

The stages are subpackages (bwstack.recipes, bwstack.verify, ...) whose sources live in the checkout's
top-level folders of the same name; docs/ARCHITECTURE.md has the map and the import rule."""

from importlib import metadata

try:
    __version__ = metadata.version("bwstack")
except metadata.PackageNotFoundError:  # a checkout on sys.path without an installation
    __version__ = "0+checkout"

# The version of the JSON report's shape: bump it when a field is renamed or removed (additions keep it).
REPORT_SCHEMA_VERSION = 2
