import { create, toBinary, type DescEnum, type DescFile, type DescMessage, type DescService } from "@bufbuild/protobuf";
import { FileDescriptorProtoSchema } from "@bufbuild/protobuf/wkt";
import { Code, type ConnectRouter } from "@connectrpc/connect";
import * as v1 from "../../gen/grpc/reflection/v1/reflection_pb.js";
import * as v1alpha from "../../gen/grpc/reflection/v1alpha/reflection_pb.js";

type Request = v1.ServerReflectionRequest;
type Response = Omit<v1.ServerReflectionResponse, "$typeName" | "originalRequest"> & { originalRequest?: unknown };

/**
 * What reflection answers from: the files defining the mounted services and
 * every file they import, indexed by file name and by fully-qualified symbol
 * (services, methods, messages, fields, enums, enum values, extensions).
 */
export class DescriptorIndex {
  readonly services: readonly string[];
  private readonly files = new Map<string, DescFile>();
  private readonly symbols = new Map<string, DescFile>();
  private readonly extensions = new Map<string, Map<number, DescFile>>();
  private readonly encoded = new Map<DescFile, Uint8Array>();

  constructor(services: readonly DescService[]) {
    this.services = [...new Set(services.map((s) => s.typeName))].sort();
    for (const service of services) this.addFile(service.file);
  }

  private addFile(file: DescFile): void {
    if (this.files.has(file.proto.name)) return;
    this.files.set(file.proto.name, file);
    for (const dep of file.dependencies) this.addFile(dep);
    const addEnum = (e: DescEnum) => {
      this.symbols.set(e.typeName, file);
      for (const v of e.values) this.symbols.set(`${e.typeName.slice(0, e.typeName.lastIndexOf(".") + 1)}${v.name}`, file);
    };
    const addMessage = (m: DescMessage) => {
      this.symbols.set(m.typeName, file);
      for (const f of m.fields) this.symbols.set(`${m.typeName}.${f.name}`, file);
      for (const o of m.oneofs) this.symbols.set(`${m.typeName}.${o.name}`, file);
      m.nestedMessages.forEach(addMessage);
      m.nestedEnums.forEach(addEnum);
      for (const x of m.nestedExtensions) this.addExtension(x.extendee.typeName, x.number, x.typeName, file);
    };
    file.messages.forEach(addMessage);
    file.enums.forEach(addEnum);
    for (const s of file.services) {
      this.symbols.set(s.typeName, file);
      for (const m of s.methods) this.symbols.set(`${s.typeName}.${m.name}`, file);
    }
    for (const x of file.extensions) this.addExtension(x.extendee.typeName, x.number, x.typeName, file);
  }

  private addExtension(extendee: string, number: number, typeName: string, file: DescFile): void {
    this.symbols.set(typeName, file);
    let numbers = this.extensions.get(extendee);
    if (numbers === undefined) this.extensions.set(extendee, (numbers = new Map()));
    numbers.set(number, file);
  }

  /** The file and every file it imports, each serialized once, the file first (as gRPC servers send them). */
  fileWithImports(file: DescFile): Uint8Array[] {
    const seen = new Set<DescFile>();
    const out: Uint8Array[] = [];
    const visit = (f: DescFile) => {
      if (seen.has(f)) return;
      seen.add(f);
      let bytes = this.encoded.get(f);
      if (bytes === undefined) this.encoded.set(f, (bytes = toBinary(FileDescriptorProtoSchema, f.proto)));
      out.push(bytes);
      f.dependencies.forEach(visit);
    };
    visit(file);
    return out;
  }

  /** One request's answer (without `original_request`, which the caller adds). */
  answer(request: Request): Response {
    const notFound = (what: string): Response => ({
      validHost: "",
      messageResponse: { case: "errorResponse", value: { errorCode: Code.NotFound, errorMessage: `${what} not found` } as never },
    });
    const files = (file: DescFile): Response => ({
      validHost: "",
      messageResponse: { case: "fileDescriptorResponse", value: { fileDescriptorProto: this.fileWithImports(file) } as never },
    });
    const r = request.messageRequest;
    switch (r.case) {
      case "listServices":
        return { validHost: "", messageResponse: { case: "listServicesResponse", value: { service: this.services.map((name) => ({ name })) } as never } };
      case "fileByFilename": {
        const file = this.files.get(r.value);
        return file === undefined ? notFound(`file ${JSON.stringify(r.value)}`) : files(file);
      }
      case "fileContainingSymbol": {
        const file = this.symbols.get(r.value.replace(/^\./, ""));
        return file === undefined ? notFound(`symbol ${JSON.stringify(r.value)}`) : files(file);
      }
      case "fileContainingExtension": {
        const file = this.extensions.get(r.value.containingType.replace(/^\./, ""))?.get(r.value.extensionNumber);
        return file === undefined ? notFound(`extension ${r.value.extensionNumber} of ${JSON.stringify(r.value.containingType)}`) : files(file);
      }
      case "allExtensionNumbersOfType": {
        const typeName = r.value.replace(/^\./, "");
        if (!this.symbols.has(typeName)) return notFound(`type ${JSON.stringify(r.value)}`);
        const numbers = [...(this.extensions.get(typeName)?.keys() ?? [])].sort((a, b) => a - b);
        return { validHost: "", messageResponse: { case: "allExtensionNumbersResponse", value: { baseTypeName: typeName, extensionNumber: numbers } as never } };
      }
      default:
        return { validHost: "", messageResponse: { case: "errorResponse", value: { errorCode: Code.InvalidArgument, errorMessage: "the request names nothing to look up" } as never } };
    }
  }
}

/** The reflection services' own definitions, so a server can list them among its services. */
export const reflectionServices: readonly DescService[] = [v1.ServerReflection, v1alpha.ServerReflection];

/**
 * gRPC server reflection, versions v1 and v1alpha, over gRPC, gRPC-Web and
 * Connect: `buf curl`, grpcurl and grpc-js reflection clients learn every
 * mounted service from the server itself, with no schema at hand.
 */
export function reflectionRoutes(index: DescriptorIndex): (router: ConnectRouter) => void {
  return (router) => {
    const versions = [
      { service: v1.ServerReflection, response: v1.ServerReflectionResponseSchema },
      { service: v1alpha.ServerReflection, response: v1alpha.ServerReflectionResponseSchema },
    ] as const;
    for (const { service, response } of versions) {
      router.service(service as typeof v1.ServerReflection, {
        async *serverReflectionInfo(requests) {
          for await (const request of requests) {
            yield create(response as typeof v1.ServerReflectionResponseSchema, { ...index.answer(request), originalRequest: request } as never);
          }
        },
      });
    }
  };
}
