"""``python -m pgmflow`` is the ``pgmflow`` command."""

from pgmflow.core.cli import main

if __name__ == "__main__":
    main()
