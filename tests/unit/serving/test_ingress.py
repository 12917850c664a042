from infergate.serving.ingress import PAGE_NAME, error_page, write_error_pages

RAY_SERVES_PAGE = (
    b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: text/plain\r\n"
    b"Content-Length: 21\r\n\r\nInternal Server Error"
)


def test_the_page_is_a_whole_json_503_with_retry_after():
    head, _, body = error_page().partition(b"\r\n\r\n")
    lines = head.split(b"\r\n")
    assert lines[0] == b"HTTP/1.1 503 Service Unavailable"
    assert b"Content-Type: application/json" in lines and b"Retry-After: 1" in lines
    assert f"Content-Length: {len(body)}".encode() in lines
    assert body.startswith(b'{"error":') and b'"type":"backend_unavailable"' in body


def test_ray_serves_pages_are_replaced_in_every_node_folder_and_only_once(tmp_path):
    for node in ("node-a", "node-b"):
        (tmp_path / node).mkdir()
        (tmp_path / node / PAGE_NAME).write_bytes(RAY_SERVES_PAGE)
    (tmp_path / "node-a" / "haproxy.cfg").write_text("untouched")
    assert write_error_pages(tmp_path) == 2
    assert (tmp_path / "node-b" / PAGE_NAME).read_bytes() == error_page()
    assert (tmp_path / "node-a" / "haproxy.cfg").read_text() == "untouched"
    assert write_error_pages(tmp_path) == 0  # already ours: nothing written
    (tmp_path / "node-a" / PAGE_NAME).write_bytes(RAY_SERVES_PAGE)  # its proxy restarted
    assert write_error_pages(tmp_path) == 1
    assert not list(tmp_path.glob("*/*.partial"))


def test_no_folder_yet_is_nothing_to_do(tmp_path):
    assert write_error_pages(tmp_path / "absent") == 0
