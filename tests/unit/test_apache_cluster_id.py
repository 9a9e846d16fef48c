"""The cluster id kq formats its Apache Kafka with: one in 64 random ids began with "-",
which the format tool took for an option (`kq broker --apache` then failed to start)."""

from __future__ import annotations

import base64

from broker.kafka.apache import _cluster_id


def test_a_cluster_id_is_16_bytes_that_never_look_like_an_option():
    ids = {_cluster_id() for _ in range(5_000)}  # about 78 would begin with "-" by chance
    assert len(ids) == 5_000
    assert not [i for i in ids if i.startswith("-")]
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
