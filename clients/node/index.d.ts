/** What opens a leased database (a `pg` client or pool config). */
export interface PgConfig {
  host: string
  port: number
  user: string
  password: string
  database: string
}

/** A leased database. */
export interface Lease {
  id: string
  template: string
  fingerprint: string
  database: string
  host: string
  port: number
  user: string
  password: string
  url: string
  expires_at: string
  config: PgConfig
}

export interface LeaseOptions {
  template?: string
  ttlSecs?: number
  waitMs?: number
  maxConnections?: number
  postgresVersion?: string | number
  label?: string
}

export interface ClientOptions {
  /** Default: PGLEASE_URL, else http://127.0.0.1:5480. */
  url?: string
  /** Default: PGLEASE_TOKEN. */
  token?: string
}

export interface KeptDatabase {
  id: string
  template: string | null
  database: string
  label: string | null
  url: string
  kept_at: string
  expires_at: string
}

export class PgleaseError extends Error {
  status: number
  code: string
  detail: string
}

export class PgleaseUnavailableError extends Error {}

export class PgleaseClient {
  constructor(options?: ClientOptions)
  url: string
  lease(options?: LeaseOptions): Promise<Lease>
  release(id: string, options?: { keepSecs?: number }): Promise<void>
  renew(id: string, ttlSecs?: number): Promise<{ id: string; expires_at: string }>
  kept(): Promise<KeptDatabase[]>
  status(): Promise<Record<string, unknown>>
}

type Hook = (fn: (context?: any) => unknown, timeout?: number) => unknown

export interface UseDatabaseOptions extends LeaseOptions, ClientOptions {
  /** Keep a failed test's database for this many seconds (default: PGLEASE_KEEP_FAILED). */
  keepFailed?: number
  /** The runner's hooks; default: the globals. */
  hooks?: { beforeEach?: Hook; afterEach?: Hook; beforeAll?: Hook; afterAll?: Hook }
  client?: PgleaseClient
  timeoutMs?: number
}

/** The current test's database: its fields are set before each test. */
export type CurrentDatabase = Partial<Lease>

export function useDatabase(options?: UseDatabaseOptions): CurrentDatabase
export function useFileDatabase(options?: UseDatabaseOptions): CurrentDatabase
export function cleanLabel(label: string): string
