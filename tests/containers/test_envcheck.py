"""make check's compiler and module checks (the rest of the report is exercised by test_driver)."""

from wmrl.containers.envcheck import NOT_PROVEN, check_compiler, check_jit, check_modules


def test_a_c_extension_builds_and_imports_with_this_interpreter(tmp_path):
    r = check_compiler(tmp_path / "logs")
    assert r["status"] == "ok", r
    assert "-shared" in (tmp_path / "logs" / "compile.log").read_text()


def test_missing_python_headers_fail_with_what_to_install(tmp_path):
    r = check_compiler(tmp_path / "logs", include=str(tmp_path / "no_headers"))
    assert r["status"] == "fail"
    assert "Python.h is missing" in r["error"] and "-dev" in r["error"]


def test_every_stage_module_of_the_policy_side_imports_and_every_config_validates():
    r = check_modules("train")
    assert r["status"] == "ok", r["failed"]


def test_jit_smoke_only_when_asked_and_the_report_says_what_it_does_not_prove(tmp_path):
    assert check_jit(False, tmp_path)["status"] == "skipped"
    assert any("converges" in line for line in NOT_PROVEN)
