"""ChaCha20 kernels against RFC 8439's published vectors and the ``cryptography`` library."""
from __future__ import annotations

import functools
import warnings

import numpy as np
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms

from estimators import randomness as R

# RFC 8439 §2.3.2 (key 00..1f, nonce 00:00:00:09:00:00:00:4a:00:00:00:00, counter 1) and
# Appendix A.1 test vectors #1 (all zero, counter 0) and #2 (all zero, counter 1).
RFC_2_3_2 = bytes.fromhex(
    "10f1e7e4d13b5915500fdd1fa32071c4c7d1f4c733c068030422aa9ac3d46c4e"
    "d2826446079faa0914c2d705d98b02a2b5129cd1de164eb9cbd083e8a2503c4e")
RFC_A1_1 = bytes.fromhex(
    "76b8e0ada0f13d90405d6ae55386bd28bdd219b8a08ded1aa836efcc8b770dc7"
    "da41597c5157488d7724e03fb8d84a376a43b8f41518a11cc387b669b2ee6586")
RFC_A1_2 = bytes.fromhex(
    "9f07e7be5551387a98ba977c732d080dcb0f29a048e3656912c6533e32ee7aed"
    "29b721769ce64e43d57133b074d839d531ed1f28510afb45ace10a1f4b794d6f")
VECTORS = [
    (bytes(range(32)), 1, bytes.fromhex("000000090000004a00000000"), RFC_2_3_2),
    (bytes(32), 0, bytes(12), RFC_A1_1),
    (bytes(32), 1, bytes(12), RFC_A1_2),
]


def _words(b: bytes) -> np.ndarray:
    return np.frombuffer(b, dtype="<u4").copy()


def _library_keystream(key: bytes, counter: int, nonce: bytes, nbytes: int) -> bytes:
    """ChaCha20 keystream from the ``cryptography`` library (OpenSSL): 16-byte nonce = counter || nonce."""
    enc = Cipher(algorithms.ChaCha20(key, counter.to_bytes(4, "little") + nonce), mode=None).encryptor()
    return enc.update(bytes(nbytes))


@pytest.mark.parametrize("key,counter,nonce,want", VECTORS)
def test_block_kernels_equal_rfc8439_vectors(key, counter, nonce, want):
    k, nn = _words(key), _words(nonce)
    out = np.empty(16, dtype=np.uint32)
    R.chacha20_block(k, counter, nn[0], nn[1], nn[2], out)
    assert out.tobytes() == want
    assert R.np_chacha20_blocks(k, [counter], nn).tobytes() == want
    assert _library_keystream(key, counter, nonce, 64) == want


def test_vector_check_can_fail():
    k = _words(bytes(range(32)))
    out = np.empty(16, dtype=np.uint32)
    R.chacha20_block(k, 2, 9 << 24, 0x4A << 24, 0, out)  # counter 2: another block
    assert out.tobytes() != RFC_2_3_2


def test_streams_equal_library_keystream_per_row_keys():
    rng = np.random.default_rng(5)
    n, nwords = 37, 24  # 3 blocks per row, rows not a multiple of the 16 lanes
    keys = rng.integers(0, 1 << 32, size=(n, 8), dtype=np.uint32)
    inputs = rng.integers(0, 1 << 63, size=n, dtype=np.uint64)
    out = np.zeros((n, nwords), dtype=np.uint64)
    R.fill_words(keys, True, R.PRR, inputs, 0, n, out)
    ref = R.np_stream_words(keys, R.PRR, inputs, nwords)
    np.testing.assert_array_equal(out, ref)
    for r in (0, 17, 36):
        a = int(inputs[r])
        nonce = np.array([R.PRR, a & 0xFFFFFFFF, a >> 32], dtype="<u4").tobytes()
        lib = _library_keystream(keys[r].tobytes(), 0, nonce, 8 * nwords)
        assert out[r].tobytes() == lib


def test_streams_shared_key_by_row_and_partial_range():
    key = R.keys_from(None, 1)
    n, nwords = 50, 8
    full = R.np_stream_words(key, R.NOISE, np.arange(n), nwords)
    out = np.zeros((20, nwords), dtype=np.uint64)
    R.fill_words(key, False, R.NOISE, np.zeros(0, dtype=np.uint64), 13, 33, out)
    np.testing.assert_array_equal(out, full[13:33])
    nonce = np.array([R.NOISE, 13, 0], dtype="<u4").tobytes()
    assert out[0].tobytes() == _library_keystream(key[0].tobytes(), 0, nonce, 64)


def test_stream_word_extends_a_prefix_consistently():
    rng = np.random.default_rng(6)
    key = rng.integers(0, 1 << 32, size=8, dtype=np.uint32)
    a = np.uint64(123456789012345)
    full = R.np_stream_words(key, R.BITFLIP_J, [a], 40)[0]
    prefix = full[:8].copy()
    cache = np.zeros(9, dtype=np.uint64)
    got = np.array([_stream_word(key, a, prefix, j, cache) for j in range(40)], dtype=np.uint64)
    np.testing.assert_array_equal(got, full)


def _stream_word(key, a, prefix, j, cache):
    return _stream_word_kernel()(key, a, prefix, j, cache)


@functools.cache
def _stream_word_kernel():
    """``R.stream_word`` called from a numba kernel, compiled once (a kernel defined per call compiled 40 times)."""
    import numba as nb

    @nb.njit
    def one(key, a, prefix, j, cache):
        return R.stream_word(key, R.BITFLIP_J, a, prefix, j, cache)
    return one


def test_keys_are_256_bit_from_the_os_csprng():
    keys = R.keys_from(None, 1000)
    assert keys.dtype == np.uint32 and keys.shape == (1000, 8)  # 8 x 32 = 256 bits per key
    assert len({k.tobytes() for k in keys}) == 1000
    assert 0.45 < np.unpackbits(keys.view(np.uint8)).mean() < 0.55
    assert R.noise_key().shape == (8,)


def test_seeded_keys_are_labelled_simulation():
    with pytest.warns(R.SimulationWarning, match="simulation mode"):
        a = R.keys_from(np.random.default_rng(1), 3)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", R.SimulationWarning)
        b = R.keys_from(np.random.default_rng(1), 3)
    np.testing.assert_array_equal(a, b)
    with pytest.raises(TypeError, match="numpy Generator"):
        R.keys_from(1234, 3)  # an int seed is neither the CSPRNG nor an explicit Generator


@pytest.mark.parametrize("w0,count", [(0, 64), (5, 3), (13, 300), (8, 8)])
def test_fill_run_equals_library_keystream(w0, count):
    key = R.keys_from(None, 1)[0]
    out = np.zeros(count, dtype=np.uint64)
    R.fill_run(key, R.NOISE, 7, w0, out)
    nonce = np.array([R.NOISE, 7, 0], dtype="<u4").tobytes()
    lib = _library_keystream(key.tobytes(), 0, nonce, 8 * (w0 + count))
    assert out.tobytes() == lib[8 * w0:]
    np.testing.assert_array_equal(out, R.np_stream_words(key, R.NOISE, [7], w0 + count)[0, w0:])
