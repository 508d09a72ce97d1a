"""``python -m lockstep``: the same command as ``lockstep`` (child processes use this form)."""

from lockstep.cli import main

if __name__ == "__main__":
    main()
