// Types of the npm package `pglease` (index.js).

/**
 * The path of the pglease binary: PGLEASE_BIN when set, else the one in this platform's
 * package (@pglease/linux-x64, …), else a `pglease` on PATH. Throws an error naming the
 * platforms there are packages for and PGLEASE_BIN when there is none.
 */
export function binaryPath(): string

/** The platforms with a package, keyed `${process.platform}-${process.arch}`. */
export const PLATFORMS: Readonly<
  Record<string, { package: string; libc?: 'glibc' | 'musl'; needs: string }>
>
