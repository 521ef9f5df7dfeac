"""Whether a store may hand over artefacts that hold native code (inductor's packages):
loading one runs it, so a hostile file there is code run as the user.

Such an artefact loads only when it is signed under CHAIN_MEMORY_KEY (the store checked
the HMAC), or when it comes from a local folder store that only this user can change, and
then trust is decided on what is opened (`backends.common.trusted`): every folder from `/`
down opened no-follow and `fstat`ed (the ancestors the user's or root's, writable by no one
else unless sticky; the store's folder and its artefact folder the user's and private), the
file opened relative to its checked folder and read from the checked descriptor. A Redis
store, or a folder others can write to, needs the key. A file that vanished is not trusted.
"""

from __future__ import annotations

from backends.common.trusted import read_trusted, why_untrusted_path
from chain.memory.entry import SIGNING_KEY_ENV, signing_key
from chain.memory.stores import LocalStore, Store, StoreUnavailable


def _unsigned() -> str:
    return f"not signed (no {SIGNING_KEY_ENV})"


def why_untrusted(store: Store, key: str) -> str | None:
    """Why the artefacts under `store` may not be loaded as native code (None: they may, or
    the folders do not exist yet). An advance answer: `read_native` decides on the file."""
    if signing_key() is not None:
        return None
    if not isinstance(store, LocalStore):
        return f"{_unsigned()} and the store is not a local folder ({store.location})"
    path = store.artefacts().directory / f"{key}.bin"
    why = why_untrusted_path(path, store.directory)
    return f"{_unsigned()} and {why}" if why is not None else None


def read_native(store: Store, key: str) -> tuple[bytes | None, str | None]:
    """The stored form of the native artefact under `key` (None when there is none) and
    why it is refused (None: it may be loaded): signed stores are read as usual (the HMAC
    is checked when decoded); an unsigned local store is read from checked descriptors."""
    artefacts = store.artefacts()
    if signing_key() is not None:
        return artefacts.get(key), None
    if not isinstance(store, LocalStore) or not isinstance(artefacts, LocalStore):
        return None, f"{_unsigned()} and the store is not a local folder ({store.location})"
    path = artefacts.directory / f"{key}.bin"
    try:
        return read_trusted(path, artefacts.max_bytes, root=store.directory), None
    except FileNotFoundError:
        return None, None  # nothing there (or gone): nothing is loaded
    except OSError as error:  # Untrusted names the folder or file; UnsafeFile what it is
        if isinstance(error, StoreUnavailable):
            raise
        return None, f"{_unsigned()} and {error}"
