// A Node app receiving hookledger's deliveries, verified with the official library.
//
//   npm install standardwebhooks
//   HOOKLEDGER_FORWARD_SECRET=whsec_... node examples/app.mjs       # listens on 127.0.0.1:9000
import http from "node:http";
import { Webhook } from "standardwebhooks";

const webhook = new Webhook(process.env.HOOKLEDGER_FORWARD_SECRET);
const seen = new Set(); // use a unique key in your database instead

http
  .createServer((req, res) => {
    const chunks = [];
    req.on("data", (c) => chunks.push(c));
    req.on("end", () => {
      const body = Buffer.concat(chunks).toString("utf8");
      let event;
      try {
        // Verify the raw body, before parsing.
        event = webhook.verify(body, req.headers);
      } catch (e) {
        console.log("rejected:", e.message);
        res.writeHead(400).end();
        return;
      }
      const id = req.headers["webhook-id"]; // = the Stripe event id = Idempotency-Key
      if (!seen.has(id)) {
        seen.add(id);
        console.log("verified", id, event.type);
      }
      res.writeHead(200).end();
    });
  })
  .listen(Number(process.env.PORT ?? 9000), "127.0.0.1");
