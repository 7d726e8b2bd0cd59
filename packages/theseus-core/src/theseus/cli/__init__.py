"""The ``theseus`` command line: ``jobs``, ``configure``, ``run``, ``data prepare``, plug-ins."""

from theseus.cli import _data, _import, _sample, _submit, _verbs
from theseus.cli._app import ENTRY_POINT_GROUP, PluginError, TheseusGroup, common_options, main
from theseus.cli._cluster import cluster_options
from theseus.cli._root import EXISTING_ROOT, ROOT, ROOT_HELP, RootPath, root_argument
from theseus.cli._sample import open_trainer, require_store, target_node

del _data, _import, _sample, _submit, _verbs  # imported for their verbs

__all__ = [
    "ENTRY_POINT_GROUP",
    "EXISTING_ROOT",
    "ROOT",
    "ROOT_HELP",
    "PluginError",
    "RootPath",
    "TheseusGroup",
    "cluster_options",
    "common_options",
    "main",
    "open_trainer",
    "require_store",
    "root_argument",
    "target_node",
]
