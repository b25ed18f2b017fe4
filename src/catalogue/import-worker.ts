import { parentPort } from "node:worker_threads";
import { readParcel } from "./import-parcel.ts";

/** A worker thread of the file import: reads the parcels it is sent and sends back what it read, its bytes moved, not copied. */
parentPort!.on("message", ({ parcel, first }: { parcel: Uint8Array; first: boolean }) => {
  const read = readParcel(Buffer.from(parcel.buffer, parcel.byteOffset, parcel.byteLength), first);
  parentPort!.postMessage(read, [read.bytes.buffer]);
});
