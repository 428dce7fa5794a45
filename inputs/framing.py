"""TFRecord framing read in plain Python: the cheap checks that name a damaged file.

A TFRecord file is a sequence of records, each framed as::

    uint64 length (little-endian) | uint32 masked CRC-32C of those 8 bytes
    data (length bytes)           | uint32 masked CRC-32C of the data

TensorFlow's reader reports a damaged frame as "corrupted record at <offset>"
or "truncated record at <offset>" without saying in which file. Reading the
frames here, through `tf.io.gfile` (no TensorFlow runtime started, so the
loaders may call it before the strategy exists), lets a loader refuse a
damaged shard up front and lets a failed run say which file holds the
offset. Nothing here reads a whole file unless asked to (`count_records`
reads only the 12-byte headers, seeking over the data).
"""

from __future__ import annotations

import gzip
import io
import os
import struct
import zlib
from typing import Optional

import tensorflow as tf

HEADER_BYTES = 12
FOOTER_BYTES = 4


def _crc32c_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
        table.append(crc)
    return table


_TABLE = _crc32c_table()


def masked_crc32c(data: bytes) -> int:
    """TFRecord's checksum: CRC-32C (Castagnoli), rotated and offset ("masked").

    Pure Python (about 10 MB/s): used on headers, and on one record's data
    only when a run has already failed and the damaged file must be named.
    """
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    crc ^= 0xFFFFFFFF
    return ((((crc >> 15) | (crc << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


class _ZlibReader:
    """A read(n) stream over a ZLIB-compressed file (TFRecordOptions('ZLIB'))."""

    def __init__(self, raw):
        self._raw, self._inflate, self._buffer = raw, zlib.decompressobj(), b""

    def read(self, n: int) -> bytes:
        while len(self._buffer) < n:
            chunk = self._raw.read(1 << 16)
            if not chunk:
                self._buffer += self._inflate.flush()
                break
            self._buffer += self._inflate.decompress(chunk)
        out, self._buffer = self._buffer[:n], self._buffer[n:]
        return out


def _stream(raw, compression: str):
    return (gzip.GzipFile(fileobj=raw) if compression == "GZIP"
            else _ZlibReader(raw) if compression == "ZLIB" else raw)


def _length(header: bytes) -> Optional[int]:
    """The record length a 12-byte header announces, or None if its CRC is wrong."""
    (length,) = struct.unpack("<Q", header[:8])
    (crc,) = struct.unpack("<I", header[8:12])
    return length if masked_crc32c(header[:8]) == crc else None


class Damaged(Exception):
    """A frame that TensorFlow's reader would refuse; the message says which and why."""


def first_record(path: str, compression: str = "") -> Optional[bytes]:
    """The first serialized record of a TFRecord file, or None if it has none.

    Raises:
      Damaged: the file ends inside the first frame, or the first header's
        checksum is wrong (random bytes, a text file, a compressed file read
        as uncompressed).
    """
    with tf.io.gfile.GFile(path, "rb") as raw:
        stream = _stream(raw, compression)
        header = stream.read(HEADER_BYTES)
        if not header:
            return None
        if len(header) < HEADER_BYTES:
            raise Damaged("it ends inside the first record's header")
        length = _length(header)
        if length is None:
            raise Damaged("the first record's header fails its checksum")
        data = stream.read(length)
        if len(data) < length:
            raise Damaged("the first record is cut short")
        return data


def _skip(stream, raw, compression: str, position: int, count: int) -> bool:
    """Moves past `count` bytes (a seek when uncompressed); False if the file ends first."""
    if not compression:
        if position + count > raw.size():
            return False
        raw.seek(position + count)
        return True
    while count:
        chunk = stream.read(min(count, 1 << 20))
        if not chunk:
            return False
        count -= len(chunk)
    return True


class _LocalFile(io.FileIO):
    """A local file read with plain system calls: `tf.io.gfile.GFile`'s
    per-call overhead made a header walk about 100 µs a record (a minute for
    ImageNet's 1.28 M); `size()` as GFile has it."""

    def size(self) -> int:
        return os.fstat(self.fileno()).st_size


def _open(path: str):
    return _LocalFile(path, "rb") if "://" not in path else tf.io.gfile.GFile(path, "rb")


def count_records(path: str, compression: str = "") -> int:
    """The records of a TFRecord file, by walking its headers (12 bytes read
    per record; the data is skipped, by seeking when uncompressed; a local
    file through plain system calls, `_LocalFile`).

    Raises:
      Damaged: a header fails its checksum or the file ends inside a frame,
        naming the record index and byte offset.
    """
    with _open(path) as raw:
        stream, position, index = _stream(raw, compression), 0, 0
        while True:
            header = stream.read(HEADER_BYTES)
            if not header:
                return index
            where = f"record {index} (byte {position})"
            if len(header) < HEADER_BYTES:
                raise Damaged(f"{where} is cut short: the file ends inside its header")
            length = _length(header)
            if length is None:
                raise Damaged(f"{where} has a header that fails its checksum")
            if not _skip(stream, raw, compression, position + HEADER_BYTES,
                         length + FOOTER_BYTES):
                raise Damaged(f"{where} is cut short: it holds {length} bytes and the file "
                              "ends first")
            position += HEADER_BYTES + length + FOOTER_BYTES
            index += 1


def damage_at(path: str, offset: int, compression: str = "") -> Optional[str]:
    """What is wrong with the record TensorFlow's reader refused at byte
    `offset` of `path`'s (uncompressed) stream, or None when `path` is not
    the file it meant: its frames do not reach `offset` intact, or the record
    there reads. TensorFlow names a record's start when its header is bad and
    the start of its data (12 bytes on) when the data is; both are accepted.
    Walks the headers before `offset`: one read per earlier record."""
    try:
        with tf.io.gfile.GFile(path, "rb") as raw:
            stream, position, index = _stream(raw, compression), 0, 0
            while position < offset and position + HEADER_BYTES != offset:
                header = stream.read(HEADER_BYTES)
                length = _length(header) if len(header) == HEADER_BYTES else None
                if length is None or not _skip(stream, raw, compression,
                                               position + HEADER_BYTES, length + FOOTER_BYTES):
                    return None
                position += HEADER_BYTES + length + FOOTER_BYTES
                index += 1
            if position > offset:
                return None
            where = f"record {index} (byte {position})"
            header = stream.read(HEADER_BYTES)
            if not header:
                return None
            if len(header) < HEADER_BYTES:
                return f"{where} is cut short: the file ends inside its header"
            length = _length(header)
            if length is None:
                return f"{where} has a header that fails its checksum" + (
                    " (is this a TFRecord file?)" if position == 0 else "")
            data = stream.read(length + FOOTER_BYTES)
            if len(data) < length + FOOTER_BYTES:
                return f"{where} is cut short: it holds {length} bytes and the file ends first"
            (crc,) = struct.unpack("<I", data[length:])
            if masked_crc32c(data[:length]) != crc:
                return f"{where} fails its data checksum"
            return None
    except (OSError, EOFError, zlib.error, tf.errors.OpError) as error:
        return f"it cannot be read ({type(error).__name__})"
