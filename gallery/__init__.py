"""gallery: the sample review site of a run directory (docs/gallery.md).

    python -m gallery runs/NAME [--serve]          # or: flowgrpo-gallery runs/NAME
    from gallery import build_site; build_site("runs/NAME")   # -> runs/NAME/gallery/index.html

Reads only the run directory's files (config.yaml, metrics.jsonl, samples/*/manifest.jsonl and the
sample files, review/flags.json); it never imports the training code.
"""

from gallery.build import build_site

__all__ = ["build_site"]
