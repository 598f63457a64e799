"""``python -m pgmflow`` is the ``pgmflow`` command."""

from pgmflow.pipelines.core.cli import main

if __name__ == "__main__":
    main()
