/* version.h - the version nxd and nxctl report (--version). */
#ifndef NX_VERSION_H
#define NX_VERSION_H

#define NX_VERSION "0.1.0"

#endif
