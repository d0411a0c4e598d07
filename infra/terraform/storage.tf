# S3 buckets for the DVC remote and MLflow artifacts: KMS-encrypted, versioned,
# private, TLS-only. Pods reach them through EKS Pod Identity (iam.tf).
resource "aws_kms_key" "data" {
  description             = "${var.cluster_name}: S3 data buckets, RDS and ECR"
  enable_key_rotation     = true
  deletion_window_in_days = 30
  policy                  = data.aws_iam_policy_document.kms.json
}

data "aws_iam_policy_document" "kms" {
  # checkov:skip=CKV_AWS_109:The key policy must delegate to the account's IAM (root principal); IAM policies scope who uses it.
  # checkov:skip=CKV_AWS_111:Same: this is the standard key policy that lets IAM policies grant use of the key.
  # checkov:skip=CKV_AWS_356:"*" in a key policy means "this key", not every resource.
  statement {
    sid       = "AccountAdministersKeyThroughIAM"
    actions   = ["kms:*"]
    resources = ["*"]
    principals {
      type        = "AWS"
      identifiers = ["arn:aws:iam::${data.aws_caller_identity.current.account_id}:root"]
    }
  }
}

resource "aws_kms_alias" "data" {
  name          = "alias/${var.cluster_name}-data"
  target_key_id = aws_kms_key.data.key_id
}

locals {
  buckets = {
    dvc    = var.dvc_bucket_name
    mlflow = var.mlflow_bucket_name
  }
}

resource "aws_s3_bucket" "this" {
  # checkov:skip=CKV_AWS_144:Cross-region replication doubles storage cost; versioning covers accidental deletes. Enable per team policy.
  # checkov:skip=CKV_AWS_18:Server access logging needs a third, log bucket; CloudTrail data events are the recommended audit path.
  # checkov:skip=CKV2_AWS_62:No consumer for S3 event notifications; DVC and MLflow poll.
  for_each = local.buckets
  bucket   = each.value
}

resource "aws_s3_bucket_public_access_block" "this" {
  for_each                = aws_s3_bucket.this
  bucket                  = each.value.id
  block_public_acls       = true
  block_public_policy     = true
  ignore_public_acls      = true
  restrict_public_buckets = true
}

resource "aws_s3_bucket_ownership_controls" "this" {
  for_each = aws_s3_bucket.this
  bucket   = each.value.id
  rule {
    object_ownership = "BucketOwnerEnforced"
  }
}

resource "aws_s3_bucket_versioning" "this" {
  for_each = aws_s3_bucket.this
  bucket   = each.value.id
  versioning_configuration {
    status = "Enabled"
  }
}

resource "aws_s3_bucket_server_side_encryption_configuration" "this" {
  for_each = aws_s3_bucket.this
  bucket   = each.value.id
  rule {
    apply_server_side_encryption_by_default {
      sse_algorithm     = "aws:kms"
      kms_master_key_id = aws_kms_key.data.arn
    }
    bucket_key_enabled = true
  }
}

resource "aws_s3_bucket_lifecycle_configuration" "this" {
  for_each = aws_s3_bucket.this
  bucket   = each.value.id
  rule {
    id     = "tidy"
    status = "Enabled"
    filter {}
    abort_incomplete_multipart_upload {
      days_after_initiation = 7
    }
    noncurrent_version_expiration {
      noncurrent_days = 90
    }
  }
}

data "aws_iam_policy_document" "tls_only" {
  for_each = aws_s3_bucket.this
  statement {
    sid       = "DenyInsecureTransport"
    effect    = "Deny"
    actions   = ["s3:*"]
    resources = [each.value.arn, "${each.value.arn}/*"]
    principals {
      type        = "*"
      identifiers = ["*"]
    }
    condition {
      test     = "Bool"
      variable = "aws:SecureTransport"
      values   = ["false"]
    }
  }
}

resource "aws_s3_bucket_policy" "tls_only" {
  for_each = aws_s3_bucket.this
  bucket   = each.value.id
  policy   = data.aws_iam_policy_document.tls_only[each.key].json
}

# Container registry for the arl image (flow runs, Ray workers).
resource "aws_ecr_repository" "arl" {
  name                 = var.cluster_name
  image_tag_mutability = "IMMUTABLE"
  image_scanning_configuration {
    scan_on_push = true
  }
  encryption_configuration {
    encryption_type = "KMS"
    kms_key         = aws_kms_key.data.arn
  }
}
