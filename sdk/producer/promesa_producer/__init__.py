"""Publish events to Promesa without losing them.

    from promesa_producer import Client
    client = Client("https://promesa.example.com", TOKEN, spool="/var/lib/myapp/promesa-spool.db")
    client.publish("file.updated", {"resource_id": "f_123", "resource_version": 7})
    client.put_consumer("cus_8812", name="Acme Corp")  # one of your customers, by your own id
    client.publish("invoice.paid", {"resource_id": "in_77"}, consumer="cus_8812")  # to its endpoints alone
"""

from .client import MAX_BATCH, RETRY_STATUSES, Client, Consumer, Flushed, PortalLink, Published, new_id
from .errors import AuthError, PromesaError, Rejected, Unavailable
from .spool import Spool, SpooledEvent, SpoolError

__all__ = ["MAX_BATCH", "RETRY_STATUSES", "AuthError", "Client", "Consumer", "Flushed", "PortalLink", "PromesaError",
           "Published", "Rejected", "Spool", "SpoolError", "SpooledEvent", "Unavailable", "new_id"]
