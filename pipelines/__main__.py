"""``python -m pgmflow.pipelines`` is the ``pgmflow`` command (as is ``python -m pgmflow``)."""

from pgmflow.pipelines.core.cli import main

if __name__ == "__main__":
    main()
