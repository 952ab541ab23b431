#ifndef CQPDF_SHIM_H
#define CQPDF_SHIM_H
// libqpdf's C API (Debian libqpdf-dev): reading, checking and writing PDF files.
#include <qpdf/qpdf-c.h>
#endif
