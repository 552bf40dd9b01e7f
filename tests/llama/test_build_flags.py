"""How llama-cpp-python is built for a backend: the Vulkan option, the guard older Vulkan headers need,
and a kept wheel's name, which changes with anything that went into the build."""

from __future__ import annotations

from pathlib import Path

import pytest

from snapcache.llama.setup import build_flags

# The lines of ggml_vk_instance_init the guard wraps, as llama.cpp (vendored by llama-cpp-python
# 0.3.36) writes them.
INSTANCE_INIT = """    std::vector<const char*> extensions;
    VkBool32 enable_best_practice = layer_settings;
    std::vector<vk::LayerSettingEXT> settings = {
        {
            "VK_LAYER_KHRONOS_validation",
            "validate_best_practices",
            vk::LayerSettingTypeEXT::eBool32,
            1,
            &enable_best_practice
        },
    };
    vk::LayerSettingsCreateInfoEXT layer_setting_info(settings);
    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, {tail}
#ifdef __APPLE__
""".replace("{tail}", "extensions, &layer_setting_info);")


def test_the_guard_compiles_the_layer_settings_only_with_headers_that_have_them() -> None:
    guarded = build_flags.guard_layer_settings(INSTANCE_INIT)
    head, rest = guarded.split("#if VK_HEADER_VERSION >= 261\n")
    kept, plain = rest.split("#else\n")
    assert head == "    std::vector<const char*> extensions;\n"
    assert kept.startswith("    VkBool32 enable_best_practice")
    assert kept.endswith("&layer_setting_info);\n")
    assert plain == (
        "    vk::InstanceCreateInfo instance_create_info(vk::InstanceCreateFlags{}, &app_info, layers, "
        "extensions);\n#endif\n#ifdef __APPLE__\n"
    )


@pytest.mark.parametrize(
    "source",
    [
        INSTANCE_INIT.replace("enable_best_practice = layer_settings", "validate = 1"),
        INSTANCE_INIT[:-200],
        "",
    ],
)
def test_a_source_not_as_the_guard_expects_stops_the_build(source: str) -> None:
    with pytest.raises(ValueError, match="not where this guard expects them"):
        build_flags.guard_layer_settings(source)


@pytest.mark.parametrize(
    ("header", "guard"), [(239, build_flags.LAYER_SETTINGS_GUARD), (261, None), (None, None)]
)
def test_the_guard_applies_to_older_headers_only(header: int | None, guard: str | None) -> None:
    assert build_flags.source_guard(header) == guard


@pytest.mark.parametrize(
    ("cmake_args", "vulkan"),
    [
        ("-DGGML_NATIVE=OFF -DGGML_VULKAN=on", True),
        ("-DGGML_VULKAN=ON -DGGML_AVX2=ON", True),
        ("-DGGML_VULKAN:BOOL=1", True),
        ("-DGGML_VULKAN=OFF", False),
        ("-DGGML_NATIVE=OFF", False),
        ("", False),
    ],
)
def test_a_vulkan_build_is_told_by_its_cmake_arguments(cmake_args: str, vulkan: bool) -> None:
    """`--backend vulkan` and a user's own CMAKE_ARGS alike: a cpu build gets no guard."""
    assert build_flags.builds_vulkan(cmake_args) == vulkan


def test_the_vulkan_option_joins_the_cpu_flags_and_a_user_s_own_wins() -> None:
    cpu = "-DGGML_NATIVE=OFF -DGGML_AVX2=ON"
    assert build_flags.backend_cmake_args(cpu, "vulkan") == f"{cpu} -DGGML_VULKAN=on"
    assert build_flags.backend_cmake_args("", "vulkan") == "-DGGML_VULKAN=on"
    assert build_flags.backend_cmake_args("-DGGML_VULKAN=OFF", "vulkan") == "-DGGML_VULKAN=OFF"
    assert build_flags.backend_cmake_args(cpu, "cpu") == cpu


def test_the_header_version_is_read_from_the_sdk_first(tmp_path: Path) -> None:
    header = tmp_path / "include" / "vulkan" / "vulkan_core.h"
    header.parent.mkdir(parents=True)
    header.write_text("#define VK_HEADER_VERSION_COMPLETE 1\n#define VK_HEADER_VERSION 296\n")
    assert build_flags.vulkan_header_version({"VULKAN_SDK": str(tmp_path)}) == 296


def test_a_kept_wheel_is_named_by_its_backend_and_guard() -> None:
    flags = frozenset({"avx2"})
    plain = build_flags.build_key("0.3.36", "-DGGML_NATIVE=OFF", "cp311", "x86_64", flags)
    vulkan = build_flags.build_key("0.3.36", "-DGGML_NATIVE=OFF -DGGML_VULKAN=on", "cp311", "x86_64", flags)
    guarded = build_flags.build_key(
        "0.3.36",
        "-DGGML_NATIVE=OFF -DGGML_VULKAN=on",
        "cp311",
        "x86_64",
        flags,
        build_flags.LAYER_SETTINGS_GUARD,
    )
    assert len({plain, vulkan, guarded}) == 3
    # A build without a guard keeps the name it had before guards existed: its kept wheel is found.
    assert plain == build_flags.build_key("0.3.36", "-DGGML_NATIVE=OFF", "cp311", "x86_64", flags, None)


def test_missing_debian_packages_are_named() -> None:
    missing = build_flags.missing_debian_packages(["no-such-package-snapcache"])
    assert missing == ["no-such-package-snapcache"]
