"""Start-up: activation without code changes, in every process the environment asks for.

``activate()`` (public as ``cgguard.activate``) is called by the ``cgguard.pth`` line that the
package installs into site-packages, and by the bootstrap ``sitecustomize`` (the folder
``cgguard/_sitecustomize``, and sitecustomize_example). Until torch is imported, an activation with
CGGUARD_ENABLED=1 alone loads cgguard's package, this one and its post-import hook
(``importhook``), nothing else; then the hook named ``cgguard._activation:on_torch_import``
builds the configuration and patches torch.

This layer imports nothing of cgguard above it: what it calls up, it names (``module:function``),
resolved when there is work for it.
"""

# On the start-up path of every activated process: standard library only, no ``typing`` or
# ``__future__`` at runtime, and cgguard's other modules only when there is work for them.
import os
import sys

from cgguard._boot.importhook import resolve, when_imported

ENABLED = "CGGUARD_ENABLED"
ON_TORCH_IMPORT = "cgguard._activation:on_torch_import"
# CGGUARD_ENABLED parsed, and every other CGGUARD_* value checked, where it is not plainly "1".
CHECK_ENVIRONMENT = "cgguard._config.settings:activation_says_on"

# How this process was activated ("pth", "sitecustomize"; None if not): the one fact activation
# keeps, here rather than on the installation, so that an idle activation loads nothing more.
activated_by: "str | None" = None


def activate(origin: str, *, default: bool = False) -> bool:
    """Activate cgguard in this process if the environment asks for it; never raises.

    ``origin`` names the caller ("pth", "sitecustomize"). CGGUARD_ENABLED decides; when it is
    unset, ``default`` does. Returns whether cgguard is active. Idempotent: the .pth, a
    sitecustomize and an explicit install() together patch once.
    """
    global activated_by
    try:
        # CGGUARD_ENABLED=1 and nothing else, the production case, is decided without loading
        # the parser; anything else is checked, so that a typo is reported at start even by a
        # process that never imports torch.
        plain = os.environ.get(ENABLED) == "1" and not any(
            name.startswith("CGGUARD_") and name != ENABLED for name in os.environ
        )
        # Resolved by name: this layer imports nothing of cgguard above it, so that the
        # settings can name their variables from here.
        if not plain and not resolve(CHECK_ENVIRONMENT)(default):
            return False
        if activated_by is None:
            activated_by = origin
            if "torch" in sys.modules:
                resolve(ON_TORCH_IMPORT)(sys.modules["torch"])
            else:
                when_imported("torch", ON_TORCH_IMPORT)
        return True
    except Exception as exc:
        from cgguard._support.warn import warn_once

        warn_once("activate", f"could not activate, captures are not guarded: {exc!r}")
        return False
