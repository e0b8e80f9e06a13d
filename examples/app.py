"""A Python app receiving hookledger's deliveries, verified with the official library.

    pip install standardwebhooks
    HOOKLEDGER_FORWARD_SECRET=whsec_... python3 examples/app.py      # listens on 127.0.0.1:9000
"""
import json
import os
from http.server import BaseHTTPRequestHandler, HTTPServer

from standardwebhooks.webhooks import Webhook, WebhookVerificationError

webhook = Webhook(os.environ["HOOKLEDGER_FORWARD_SECRET"])
seen = set()  # use a unique key in your database instead


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        body = self.rfile.read(int(self.headers["Content-Length"]))
        try:
            # Verify the raw bytes, before parsing.
            event = webhook.verify(body, dict(self.headers))
        except WebhookVerificationError as e:
            self.send_response(400)
            self.end_headers()
            print("rejected:", e)
            return
        event_id = self.headers["webhook-id"]  # = the Stripe event id = Idempotency-Key
        if event_id not in seen:
            seen.add(event_id)
            print("verified", event_id, event["type"])
        self.send_response(200)
        self.end_headers()


HTTPServer(("127.0.0.1", int(os.environ.get("PORT", "9000"))), Handler).serve_forever()
