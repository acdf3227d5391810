"""The version of aioload, written once: the build reads it from here.

``pyproject.toml`` declares the version dynamic and setuptools takes it from this file
(``[tool.setuptools.dynamic]``, read without importing the package), so the wheel's
metadata, an editable install's, ``aioload.__version__`` and ``aioload --version`` all
say this one string.

Example::

    >>> import aioload
    >>> aioload.__version__ == __version__
    True
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
