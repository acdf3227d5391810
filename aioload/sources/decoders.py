"""Decoding the fields of a sample by their extension: images, arrays, JSON, text, labels.

:class:`Decoder` is what ``decode=`` of :class:`~aioload.sources.ShardDataset`
and :class:`~aioload.sources.ObjectDataset` accepts besides a plain callable
(``decode={"jpg": my_fn}`` builds one, merged over the defaults). It runs where
the fetch runs: in the worker with ``num_workers > 0``.

The defaults, by extension (the part of the field after its last dot, any case):

=============================  ====================================================
``jpg`` ``jpeg`` ``png``       an image as a numpy array, **HWC uint8**: shape
``webp``                       ``(height, width, channels)``, RGB (3 channels) by
                               default; ``image_mode=None`` keeps the file's own
                               mode (grayscale ``(h, w, 1)``, RGBA ``(h, w, 4)``,
                               16-bit PNG ``uint16``). Needs Pillow:
                               ``pip install 'aioload-data[image]'``.
``npy``                        a numpy array (``allow_pickle=False``)
``npz``                        a dict of numpy arrays
``json``                       the parsed object
``txt`` ``text``               a str (UTF-8)
``cls`` ``cls2`` ``index``     an int
``label``
=============================  ====================================================

Other fields stay bytes, and so do ``__key__``-like fields (starting with
``__``) and values that are not bytes. A handler always receives ``bytes`` (a
``memoryview`` or ``bytearray`` field is copied into one first), so ``json.loads(data)``
and ``PIL.Image.open(io.BytesIO(data))`` work in a handler of your own. A field that
fails to decode raises :class:`DecodeError`, naming the sample's key, the field and the
shard's URL; a missing Pillow raises ``ImportError`` naming the extra to install.
"""

from __future__ import annotations

import functools
import io
import json
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from aioload.errors import DecodeError

__all__ = [
    "IMAGE_EXTENSIONS",
    "DecodeError",
    "Decoder",
    "as_decoder",
    "decode_image",
    "default_decode",
]

IMAGE_EXTENSIONS = ("jpg", "jpeg", "png", "webp")
"""The extensions decoded as images (through Pillow) by default."""

_PILLOW_MISSING = (
    "decoding image fields (jpg, png, webp) needs Pillow: pip install 'aioload-data[image]' "
    "(or keep them as bytes: decode={'jpg': None, ...})"
)

FieldDecoder = Callable[[bytes], Any]


def decode_image(data: bytes, mode: str | None = "RGB") -> np.ndarray:
    """An encoded image (JPEG, PNG, WebP, anything Pillow opens) as an HWC numpy array.

    Args:
        data: the file's bytes.
        mode: the Pillow mode to convert to (``"RGB"``, ``"RGBA"``, ``"L"``
            ...), or None to keep the file's own.

    Returns:
        shape ``(height, width, channels)``, always with a channel axis (1 for
        grayscale); uint8 for 8-bit modes (a 16-bit PNG kept as it is gives
        uint16, mode ``"1"`` bool, a palette image kept as ``"P"`` its indices).

    Example::

        >>> import io
        >>> from PIL import Image
        >>> out = io.BytesIO()
        >>> Image.new("RGB", (4, 2), (255, 0, 0)).save(out, "PNG")
        >>> png_bytes = out.getvalue()
        >>> array = decode_image(png_bytes)        # (h, w, 3) uint8, RGB
        >>> gray = decode_image(png_bytes, "L")    # (h, w, 1) uint8
        >>> array.shape, array.dtype, array[0, 0].tolist(), gray.shape
        ((2, 4, 3), dtype('uint8'), [255, 0, 0], (2, 4, 1))
    """
    try:
        from PIL import Image
    except ImportError as error:
        raise ImportError(_PILLOW_MISSING, name="PIL") from error
    with Image.open(io.BytesIO(data)) as image:
        if mode is not None and image.mode != mode:
            converted = image.convert(mode)
        else:
            image.load()
            converted = image
        array = np.asarray(converted)
    if array.ndim == 2:
        array = array[:, :, np.newaxis]
    return array


def _decode_npy(data: bytes) -> np.ndarray:
    array: np.ndarray = np.load(io.BytesIO(data), allow_pickle=False)
    return array


def _decode_npz(data: bytes) -> dict[str, np.ndarray]:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def _decode_text(data: bytes) -> str:
    return bytes(data).decode("utf-8")


def _decode_int(data: bytes) -> int:
    return int(bytes(data))


def _decode_json(data: bytes) -> Any:
    return json.loads(bytes(data))


def _default_handlers(image_mode: str | None) -> dict[str, FieldDecoder | None]:
    image = functools.partial(decode_image, mode=image_mode)
    handlers: dict[str, FieldDecoder | None] = dict.fromkeys(IMAGE_EXTENSIONS, image)
    handlers.update(
        npy=_decode_npy,
        npz=_decode_npz,
        json=_decode_json,
        txt=_decode_text,
        text=_decode_text,
        cls=_decode_int,
        cls2=_decode_int,
        index=_decode_int,
        label=_decode_int,
    )
    return handlers


class Decoder:
    """Decodes a sample's fields by extension: the defaults, with your own merged over them.

    Args:
        handlers: extension -> ``fn(bytes) -> value`` (``"jpg"`` or
            ``".jpg"``, any case), merged over the defaults; None as a value
            keeps that extension's fields as bytes.
        defaults: start from the default handlers (images, ``npy``, ``npz``,
            ``json``, ``txt``, ``cls``: see :func:`default_decode`); False: only
            ``handlers``.
        image_mode: the Pillow mode images are converted to (default
            ``"RGB"``: always 3 channels), or None to keep each file's own
            mode (see :func:`decode_image`).

    Calling it on a sample dict returns a new dict with the fields decoded;
    :meth:`decode_field` decodes one value. Picklable when its handlers are
    (module-level functions), as worker processes need.

    Example::

        >>> import io
        >>> import numpy as np
        >>> from PIL import Image
        >>> def decode_points(data):
        ...     return np.frombuffer(data, np.float32).reshape(-1, 3)
        >>> decode = Decoder({"seg.png": None, "pts": decode_points}, image_mode=None)
        >>> png = io.BytesIO()
        >>> Image.new("L", (4, 2)).save(png, "PNG")
        >>> sample = decode({"__key__": "0017", "png": png.getvalue(), "seg.png": png.getvalue(),
        ...                  "pts": np.zeros(6, np.float32).tobytes(), "cls": b"3"})
        >>> sample["png"].shape, type(sample["seg.png"]).__name__, sample["pts"].shape
        ((2, 4, 1), 'bytes', (2, 3))
        >>> sample["cls"]
        3
        >>> # dataset = ShardDataset(urls, decode=decode)
        >>> # or: ShardDataset(urls, decode={"pts": decode_points})
    """

    def __init__(
        self,
        handlers: Mapping[str, FieldDecoder | None] | None = None,
        *,
        defaults: bool = True,
        image_mode: str | None = "RGB",
    ) -> None:
        if image_mode is not None and not isinstance(image_mode, str):
            raise TypeError(f"image_mode should be a Pillow mode (str) or None; got {image_mode!r}")
        table: dict[str, FieldDecoder | None] = _default_handlers(image_mode) if defaults else {}
        if handlers is not None:
            if not isinstance(handlers, Mapping):
                raise TypeError(
                    f"handlers should be a mapping of extension -> fn(bytes); got {handlers!r}"
                )
            for extension, handler in handlers.items():
                if not isinstance(extension, str) or not extension.strip("."):
                    raise TypeError(f"a handler's extension should be a str; got {extension!r}")
                if handler is not None and not callable(handler):
                    raise TypeError(
                        f"the handler of {extension!r} should be callable (bytes -> value) or "
                        f"None (keep the bytes); got {handler!r}"
                    )
                table[extension.lstrip(".").lower()] = handler
        self.image_mode = image_mode
        self._handlers = table

    @property
    def handlers(self) -> dict[str, FieldDecoder | None]:
        """Extension -> handler (None: kept as bytes), as this decoder uses them."""
        return dict(self._handlers)

    def handler(self, field: str) -> FieldDecoder | None:
        """The handler of a field: the one of its whole name, else of its extension."""
        handlers = self._handlers
        name = field.lower()
        if name in handlers:
            return handlers[name]
        return handlers.get(name.rpartition(".")[2]) if "." in name else None

    def __call__(self, sample: Mapping[str, Any]) -> dict[str, Any]:
        key, url = sample.get("__key__"), sample.get("__url__")
        decoded: dict[str, Any] = {}
        for field, value in sample.items():
            if field.startswith("__") or not isinstance(value, bytes | bytearray | memoryview):
                decoded[field] = value
            else:
                decoded[field] = self.decode_field(field, value, key=key, url=url)
        return decoded

    def decode_field(
        self, field: str, value: Any, *, key: str | None = None, url: str | None = None
    ) -> Any:
        """One field's value, decoded by its extension (unknown ones stay as they are).

        Raises:
            DecodeError: naming ``key``, ``field`` and ``url``, from the handler's error.
            ImportError: an image field without Pillow installed.
        """
        handler = self.handler(field)
        if handler is None:
            return value
        if isinstance(value, bytearray | memoryview):
            value = bytes(value)  # a handler's contract: bytes, which json.loads too accepts
        try:
            return handler(value)
        except ImportError as error:  # a missing package (Pillow): its own type, not bad data
            error.add_note(f"raised while decoding {_where(key, field, url)}")
            raise
        except Exception as error:
            raise DecodeError(
                f"could not decode {_where(key, field, url)}: {type(error).__name__}: {error}",
                key=key,
                field=field,
                url=url,
            ) from error

    def __repr__(self) -> str:
        return f"Decoder({sorted(self._handlers)}, image_mode={self.image_mode!r})"


def _where(key: str | None, field: str, url: str | None) -> str:
    where = f"field {field!r}"
    if key is not None:
        where += f" of sample {key!r}"
    if url is not None:
        where += f" in {url}"
    return where


_DEFAULT = Decoder()


def default_decode(sample: dict[str, Any]) -> dict[str, Any]:
    """Decodes the fields of a sample by their extension with the default :class:`Decoder`.

    Images (``jpg``, ``jpeg``, ``png``, ``webp``) -> HWC uint8 RGB arrays
    (needs Pillow), ``npy`` -> array, ``npz`` -> dict of arrays, ``json`` ->
    object, ``txt``/``text`` -> str, ``cls``/``cls2``/``index``/``label`` ->
    int; others stay bytes.

    Example::

        >>> default_decode({"__key__": "a", "cls": b"7", "txt": b"cat"})
        {'__key__': 'a', 'cls': 7, 'txt': 'cat'}
    """
    return _DEFAULT(sample)


def as_decoder(decode: Any, what: str) -> Callable[[Any], Any] | None:
    """A dataset's ``decode=`` argument as the callable it stands for.

    None stays None, a callable (a :class:`Decoder` too) stays itself, a
    mapping of extension -> handler becomes ``Decoder(mapping)``.

    Args:
        decode: the argument.
        what: what a plain callable receives, for the error message.
    """
    if decode is None:
        return None
    if callable(decode):
        function: Callable[[Any], Any] = decode
        return function
    if isinstance(decode, Mapping):
        return Decoder(decode)
    raise TypeError(
        f"decode should be callable ({what}), a Decoder, or a mapping of extension -> "
        f"fn(bytes) merged over the default decoders; got {decode!r}"
    )
