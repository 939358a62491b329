"""The activation entry of sitecustomize files copied from cgguard 0.1 (``from cgguard._startup
import activate``): a copy in an image must not leave its programs silently unguarded when
cgguard is upgraded. Its public home is ``cgguard.activate``."""

from cgguard._boot import activate

__all__ = ["activate"]
