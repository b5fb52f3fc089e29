// Types of @pglease/client, kept by hand next to lib/*.cjs; `npm test` checks them with
// `tsc --noEmit` against typed uses (test/types/).

/** What opens a leased database: a `pg` (node-postgres) `Client` or `Pool` config. */
export interface PgConfig {
  host: string
  port: number
  user: string
  password: string
  database: string
}

/** A leased database, as `POST /lease` answers it, plus the label sent and a `pg` config. */
export interface Lease {
  id: string
  template: string
  fingerprint: string
  database: string
  host: string
  port: number
  user: string
  password: string
  /** `postgres://user:password@host:port/database` */
  url: string
  /** RFC 3339; the daemon drops the database after this unless renewed. */
  expires_at: string
  /** The label sent with the lease (cleaned), or null. */
  label: string | null
  config: PgConfig
}

export interface LeaseOptions {
  /** The template to clone; default: the daemon's `default`. */
  template?: string
  /** Time to live; default: the daemon's. */
  ttlSecs?: number
  /** How long to wait for a ready clone; default: the daemon's. */
  waitMs?: number
  /** The lease's role's connection limit; default: the daemon's `--lease-connections`. */
  maxConnections?: number
  /** The PostgreSQL major (or major.minor) to lease on, e.g. 17. */
  postgresVersion?: string | number
  /** Names the lease in `GET /status` (at most 256 characters; control characters removed). */
  label?: string
}

export interface ClientOptions {
  /** Default: PGLEASE_URL, else http://127.0.0.1:5480. */
  url?: string
  /** Sent as `Authorization: Bearer <token>`; default: PGLEASE_TOKEN. */
  token?: string
}

/** A database kept after a failed test (`GET /kept`). */
export interface KeptDatabase {
  id: string
  template: string | null
  database: string
  label: string | null
  host: string
  port: number
  user: string
  password: string
  url: string
  kept_at: string
  expires_at: string
  size_bytes?: number
}

/** An open lease as `GET /status` lists it. */
export interface LeaseStatus {
  id: string
  template: string
  database: string
  expires_at: string
  label: string | null
}

/** `GET /status`; only `leases` is typed here. */
export interface Status {
  leases: LeaseStatus[]
  [field: string]: unknown
}

/** The daemon answered with an error (`{"error": {"code", "message"}}`). */
export class PgleaseError extends Error {
  /** The HTTP status, e.g. 404. */
  status: number
  /** The daemon's error code, e.g. `unknown_template`, `lease_not_found`, `timeout`. */
  code: string
  /** The daemon's message. */
  detail: string
}

/** No daemon answers at the URL; the message says how to start one. */
export class PgleaseUnavailableError extends Error {
  url: string
}

export class PgleaseClient {
  constructor(options?: ClientOptions)
  readonly url: string
  lease(options?: LeaseOptions): Promise<Lease>
  /** Drops the database, or with `keepSecs` keeps it as it is (`GET /kept`). */
  release(id: string, options?: { keepSecs?: number }): Promise<void>
  renew(id: string, ttlSecs?: number): Promise<{ id: string; expires_at: string }>
  kept(): Promise<KeptDatabase[]>
  dropKept(id: string): Promise<void>
  status(): Promise<Status>
}

/** A runner's hook registration function: vitest's and jest's both fit. */
export type Hook = (fn: (...args: any[]) => any, timeout?: number) => unknown

export interface UseDatabaseOptions extends LeaseOptions, ClientOptions {
  /** Keep a failed test's database this many seconds (true: 3600) and print its URL;
   * default: PGLEASE_KEEP_FAILED. vitest, and jest with its default runner (jest-circus). */
  keepFailed?: number | boolean
  /** The runner's hooks; default: the globals. */
  hooks?: { beforeEach?: Hook; afterEach?: Hook; beforeAll?: Hook; afterAll?: Hook }
  /** A client to use instead of one made from `url` and `token`. */
  client?: PgleaseClient
  /** The hooks' timeout; default 120000 (a lease may wait for a clone). */
  timeoutMs?: number
}

/** The database of the test (or file) running now. Reading a field when none is leased
 * (outside a test) throws. */
export type CurrentDatabase = Readonly<Lease>

/** A fresh database for every test: beforeEach leases, afterEach gives it back. */
export function useDatabase(options?: UseDatabaseOptions): CurrentDatabase
/** One database for the tests of a file (or describe): beforeAll leases, afterAll gives it back. */
export function useFileDatabase(options?: UseDatabaseOptions): CurrentDatabase
/** A label the daemon accepts: control characters removed, the last 256 characters kept. */
export function cleanLabel(label: string): string

export interface StartOptions {
  /** A daemon to use when it answers; default: PGLEASE_URL. When it does not answer, the
   * daemon started listens there (it must be a loopback address); without one, on a free
   * loopback port. */
  url?: string
  /** Start a daemon when none answers; default: true unless PGLEASE_START=0. */
  start?: boolean
  /** Arguments after `pglease serve --listen ADDRESS`, e.g.
   * `['--template', 'app=migrations:db/migrations']`; default: PGLEASE_SERVE_ARGS, split like
   * a shell would. */
  serveArgs?: string[]
  /** The pglease binary; default: PGLEASE_BIN, the npm package `pglease`, then PATH. */
  binary?: string
  /** Where the daemon's output goes; default: a new file under the temporary directory. */
  logFile?: string
  /** Environment for the daemon, over this process's. */
  env?: Record<string, string>
  /** How long to wait for GET /readyz; default 180000. */
  readyTimeoutMs?: number
}

/** The daemon of a test run. */
export interface PgleaseDaemon {
  /** Its URL, also put in PGLEASE_URL. */
  url: string
  /** Whether startPglease started it (false: it used the one answering at the URL). */
  started: boolean
  /** The started daemon's process id. */
  pid: number | undefined
  /** The started daemon's log. */
  logFile: string | undefined
  /** Stops a started daemon (SIGTERM, then waits) and puts PGLEASE_URL back as it was. */
  stop(): Promise<void>
}

/** A daemon for a test run: the one at PGLEASE_URL when it answers, else `pglease serve`
 * started and waited for until it can lease. Sets PGLEASE_URL to its URL. */
export function startPglease(options?: StartOptions): Promise<PgleaseDaemon>
