"""Lists the devices llama.cpp's ggml sees here, loading no model (stdlib + ctypes).

Runs as a script under the side environment's Python, as worker.py does (`make
llama-env`): loads ggml's CPU and Vulkan backends from the cyllama-vulkan wheel and replies
one frame (frames.py) {"devices": [{"name", "description", "type", "software"}, ...]}, every
ggml device (`ggml_backend_dev_name` / `_description` / `_type`: 0 CPU, 1 GPU, 2 iGPU), then
exits. `software` marks a Vulkan device whose Vulkan type is the CPU (Mesa's llvmpipe): ggml
reports it as a GPU and says so only in its log (ggml-vulkan.cpp's "Warning: Device type is
CPU. This is probably not the device you want." for vk::PhysicalDeviceType::eCpu, as b11669
logs it here), so that line marks it.
"""

from __future__ import annotations

from ctypes import c_char_p, c_int, c_size_t, c_void_p

from frames import reply
from worker import LOG_CB, libraries


def list_devices() -> dict:
    libs = libraries()
    G = libs["ggml"]
    for name, res, args in (("ggml_backend_load", c_void_p, [c_char_p]),
                            ("ggml_backend_dev_count", c_size_t, []),
                            ("ggml_backend_dev_get", c_void_p, [c_size_t]),
                            ("ggml_backend_dev_type", c_int, [c_void_p]),
                            ("ggml_backend_dev_name", c_char_p, [c_void_p]),
                            ("ggml_backend_dev_description", c_char_p, [c_void_p])):
        getattr(G, name).restype, getattr(G, name).argtypes = res, args
    log: list[str] = []
    keep = LOG_CB(lambda _level, text, _user: log.append(text.decode(errors="replace")))
    libs["base"].ggml_log_set.argtypes = [LOG_CB, c_void_p]
    libs["base"].ggml_log_set(keep, None)
    for key in ("cpu", "vulkan"):
        G.ggml_backend_load(libs["paths"][key].encode())
    text = "".join(log)
    out = []
    for i in range(G.ggml_backend_dev_count()):
        dev = G.ggml_backend_dev_get(i)
        name = G.ggml_backend_dev_name(dev).decode(errors="replace")
        out.append({"name": name,
                    "description": G.ggml_backend_dev_description(dev).decode(errors="replace"),
                    "type": int(G.ggml_backend_dev_type(dev)),
                    "software": name.startswith("Vulkan") and "Device type is CPU" in text})
    return {"devices": out}


if __name__ == "__main__":
    reply(list_devices())
