from app.api.uploads import upload_source_path


def test_upload_names_stay_relative_and_inside() -> None:
    assert upload_source_path("advanced/timeouts.md") == "advanced/timeouts.md"
    assert upload_source_path("../../etc/passwd") == "etc/passwd"
    assert upload_source_path("/abs/./x.txt") == "abs/x.txt"
    assert upload_source_path("C:\\docs\\win.txt") == "docs/win.txt"
    assert upload_source_path("..") == "upload"
