"""Start-up in every activated process: ``activate()``, called by the ``.pth`` line and the
bootstrap sitecustomize. Standard library only; it calls the layers above by
``module:function`` name, once there is work for them."""
