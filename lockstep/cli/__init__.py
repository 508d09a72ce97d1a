"""The ``lockstep`` command: the composition root, one module per command group.

``root`` holds the root group and the error policy; ``dev``, ``emit``, ``observe``,
``pipelines``, ``reads`` and ``demo`` hold the commands. Commands that need Spark import it
inside their body, so ``lockstep --help``, ``emit``, ``topology`` or ``explain`` start no JVM.
"""

from lockstep.cli.root import EXIT_CODES, LockstepGroup, cli, main

__all__ = ["EXIT_CODES", "LockstepGroup", "cli", "main"]
