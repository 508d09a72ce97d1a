import base64

from coordinator.dev.broker import new_cluster_id


def test_cluster_ids_are_16_bytes_and_never_look_like_a_flag() -> None:
    ids = [new_cluster_id() for _ in range(2000)]  # ~30 would start with '-' without the guard
    assert all(not i.startswith("-") and len(i) == 22 for i in ids)
    assert all(len(base64.urlsafe_b64decode(i + "==")) == 16 for i in ids)
    assert len(set(ids)) == len(ids)
