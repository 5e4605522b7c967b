"""The command lines: ``train.py`` parses the training scripts' arguments (train_t2i.py, train_t2v.py) and
``tools.py`` is the ``flowgrpo`` command (eval, gallery, pretrain-toy, pretrain-toy-video)."""

from flowgrpo.cli.tools import main

__all__ = ["main"]
