"""What a batch of produced records reached, for a writer that then waits until it is folded.

Example::

    delivered = Delivered()
    producer.produce(topic, key=key, value=value, on_delivery=delivered)
    producer.flush(30)
    follower.wait_for(delivered.marks)    # {topic: offset after the newest delivered record}
"""

from __future__ import annotations

from confluent_kafka import KafkaError, Message


class Delivered:
    """A delivery callback: per topic the offset after the newest record delivered, and the
    errors of the records that were not."""

    def __init__(self) -> None:
        self.marks: dict[str, int] = {}
        self.errors: list[str] = []

    def __call__(self, err: KafkaError | None, msg: Message) -> None:
        topic, offset = msg.topic(), msg.offset()
        if err is not None:
            self.errors.append(str(err))
        elif topic is not None and offset is not None:
            self.marks[topic] = max(self.marks.get(topic, 0), offset + 1)
