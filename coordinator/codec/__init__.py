"""Avro single-object encoding of every Lockstep event (the one codec, used everywhere)."""

from coordinator.codec.avro import SCHEMA_DIR, DecodeError, EventCodec, default_codec

__all__ = ["SCHEMA_DIR", "DecodeError", "EventCodec", "default_codec"]
