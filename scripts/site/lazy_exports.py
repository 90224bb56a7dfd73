"""The API reference sees the names a package imports on first use, as a reader of ``pimm_fn.loop`` does.

``pimm_fn`` and ``pimm_fn.compat`` keep their torch-dependent names in a ``_RUNTIME`` table, ``{name: module}``,
imported by the package's ``__getattr__``: nothing a static reader sees binds them. This griffe extension reads
the table (as a value, without importing anything) and adds each name as an alias of ``<module>.<name>``, so the
reference pages name ``pimm_fn.loop`` and follow the table wherever the module lives.
"""

import ast

import griffe

PACKAGES = ("pimm_fn", "pimm_fn.compat")


class LazyExports(griffe.Extension):
    """Adds the names of each package's ``_RUNTIME`` table as aliases of the modules that define them."""

    def on_package(self, *, pkg: griffe.Module, **kwargs) -> None:
        """Fill in the lazy names once the whole package is loaded, its submodules included."""
        for path in PACKAGES:
            if path.split(".")[0] != pkg.path:
                continue
            module = pkg if path == pkg.path else pkg.get_member(path.removeprefix(pkg.path + "."))
            table = module.members.get("_RUNTIME")
            if table is None:
                raise griffe.GriffeError(f"{path} has no _RUNTIME table: update scripts/site/lazy_exports.py")
            for name, target in ast.literal_eval(str(table.value)).items():
                module.set_member(name, griffe.Alias(name, f"{target}.{name}", parent=module))
