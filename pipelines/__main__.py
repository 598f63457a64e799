"""``python -m pipelines`` is the ``pgmflow`` command."""

from pipelines.core.cli import main

if __name__ == "__main__":
    main()
