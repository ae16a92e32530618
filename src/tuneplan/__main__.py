"""``python -m tuneplan``: the same command as the ``tuneplan`` console script."""

from tuneplan.cli.app import main

if __name__ == "__main__":
    main()
