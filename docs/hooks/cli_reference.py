"""MkDocs hook: adds ``cli.md``, the command-line reference generated from the typer app.

Named in mkdocs.yml's ``hooks:``; the page is never written by hand nor kept in git (see
`reroll.cli.reference`).
"""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import File, Files
from reroll.cli.reference import reference_markdown


def on_files(files: Files, config: Any) -> Files:
    """Add the generated ``cli.md`` to the site's files (before the navigation is built).

    Args:
        files: The pages and assets found under docs/.
        config: The site's configuration.

    Returns:
        The same collection, with ``cli.md`` added.
    """
    files.append(File.generated(config, "cli.md", content=reference_markdown()))
    return files
